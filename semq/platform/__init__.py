"""The platform (SPEC "Pieces"): the relay between organizations' nodes,
which forwards a document when its target is online and stores it when not.
``engine`` (routing, the stored copies' states, the operator's table),
``core`` (the facade: one transaction per batch, frames dispatched by kind),
the owners of the store's tables (``copies``: stored; ``seen``; ``nodes``;
``cluster``: presence and instances; ``peers``; ``cafiles``; with
``chunks``, the files kept) and the roles (``routing``, ``inquiries``,
``quota``, ``operator``; ``batch`` and ``views``, what they share and
show), ``daemon`` (the listener, one session per node), ``store`` (the
schema and its migrations), ``migrate`` (SQLite to PostgreSQL)."""
