"""The Python API for applications; the CLI uses it too.

    from semq.node.api import NodeClient
    with NodeClient("/srv/semq/acme") as node:
        lk0 = node.send("56001", b"<order/>", data_type="ORDER", key="S0001")
        for doc in node.inbox():
            handle(doc.app_data)
            node.acknowledge([doc.id])

``send`` works whether or not the node daemon runs: the document is durable
in the node's store when it returns, and goes out when the daemon runs.
"""

from .client import KNOWS_ROWS, MAX_DOCUMENT_SIZE, BadTarget, DocumentTooLarge, NodeClient
from .items import UNIT_IDS, Cursor, InboxItem, OutboxRow

__all__ = ["KNOWS_ROWS", "MAX_DOCUMENT_SIZE", "UNIT_IDS", "BadTarget", "Cursor", "DocumentTooLarge", "InboxItem",
           "NodeClient", "OutboxRow"]
