"""The store layer: opening SQLite stores (WAL, pragmas, migrations, the
corruption check, errors translated to StoreError at one point: ``db``),
the platform's PostgreSQL store (``pg``), and the one gate through which
trio code reaches a store's thread (``gate``)."""
