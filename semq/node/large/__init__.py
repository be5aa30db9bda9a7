"""Large documents: a manifest and its chunks under one LK0
(docs/large-documents.md).

``manifest`` is the format (pure, and the file helpers); ``incoming`` the
receiver's transfers (``large_in``), ``outgoing`` the origin's documents
under way (``large_out``): the store thread's halves. The daemon's chunk
sender is semq.node.daemon.large_sender (trio).
"""
