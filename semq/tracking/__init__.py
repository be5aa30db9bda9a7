"""Every hop made visible: the delivery event log the daemons write
(``events``, docs/events.md) and the searchable history built from it
(``history``: ``semq track``, the web console)."""
