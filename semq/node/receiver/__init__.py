"""The receiver's side of a node: documents for us, from their DATA to
the application's acknowledgement.

``role.Receiver`` opens and verifies a batch's documents, delivers each
once and acknowledges it (SPEC B.1-B.4). The tables it works on each have
one owner here: ``inbox`` (the inbox and the dedup table), ``pending_ack``
(the pending-ack rows and their confirmations, ``PENDING_ACK_TABLE``),
``channels`` (the ordered channels' places and held documents).
"""
