"""An organization's SEMQ node (SPEC "Pieces"), grouped by role
(docs/architecture.md, "The node: who owns which table", is the map):

- ``engine`` — every transition as a table (sans-IO);
- ``core`` — ``NodeCore``, the facade: one transaction per batch, the
  dispatch of frames by kind, the owners' deferred writes written together;
  below it ``batch`` (a batch's state), ``store`` (the schema), ``rows``
  (rows by name, the deferred-writes contract), ``users``;
- ``origin`` and ``receiver`` — each role and the owners of its tables
  (``origin.outbox``, ``receiver.inbox``, ``receiver.pending_ack``, ...);
- ``large`` — large documents' format and their tables; ``inquiries`` and
  ``housekeeping`` — over both roles;
- ``api`` — ``NodeClient``, what applications and the command use;
- ``features`` — transactions, request / reply, dead letters, local queues,
  folders, ``semq receive``'s tries;
- the trio shell — ``daemon`` (the session with the platform),
  ``direct`` (links between organizations), ``background``,
  ``large_sender`` (the chunks of our large documents).

Every table has one owner, which alone names it in SQL
(tests/node/test_table_owners.py); imports point down this list and never
loop (tests/node/test_node_imports.py)."""
