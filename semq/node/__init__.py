"""An organization's SEMQ node (SPEC "Pieces"): the state tables
(``engine``), the core that applies them to the node's SQLite store, one
transaction per batch (``core`` over its roles ``origin``, ``receiver``,
``receipts``, ``inquiries``, ``housekeeping`` and ``operator``; the writes
held in memory and the store's rows by name in ``writebehind``), the trio
daemon that connects it to the platform (``daemon``), what applications use
(``api``: ``NodeClient``) and the node's features (``txn``, ``rpc``,
``dead``, ``queues``). docs/architecture.md is the map."""
