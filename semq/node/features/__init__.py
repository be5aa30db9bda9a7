"""The node's features beside the protocol (the seed capabilities and the
folders): transactional messages (``txn``; its trio task in ``tasks``),
request / reply (``rpc``), dead letters (``dead``), local queues
(``queues``), their settings (``capabilities``), ``semq watch``'s folders
(``folders``) and ``semq receive``'s tries (``receiving``).

Each runs on a ``NodeCore`` (or a ``NodeClient``'s) and owns its own
tables; the node's tables it reaches through their owners.
"""
