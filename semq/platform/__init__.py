"""The platform (SPEC "Pieces"): the relay between organizations' nodes,
which forwards a document when its target is online and stores it when not.
``engine`` (routing and the stored copies' states), ``core`` (its SQLite
store, one transaction per batch), ``daemon`` (the listener, one session
per node), ``store`` (tables and migrations)."""
