"""The edge's trio halves inside the node daemon: the sender of our
documents to AS2 / AS4 partners (``sender.py``) and the listener for
theirs (``listener.py``); ``service.py`` starts both."""
