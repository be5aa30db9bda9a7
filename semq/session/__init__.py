"""Connections: UMX-T framed over any trio stream, with the per-identity
byte budget (``transport``), the one reader per connection and the session
kinds it handles for every role (``reader``), the frames that leave before
their commit (``early``), who a listener admits (``admission``), the narrow
interfaces between the layers (``ports``), and the client side of a node's
local sockets' waits (``inbox_wait``)."""
