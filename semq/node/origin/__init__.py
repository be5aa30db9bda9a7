"""The origin's side of a node: our documents, from accepted to confirmed.

``role.Origin`` accepts documents (SPEC A.1), claims them in send order and
encodes their DATA (A.2; signed and sealed with security) and applies what
comes back (A.3-A.6) through ``ORIGIN_TABLE`` (semq.node.engine). The
tables it works on each have one owner here: ``outbox`` (the pending-send
rows), ``channels`` (the ordered channels' numbering and gap notices),
``receipts`` (digests, receipts and refusals). ``operator`` applies the
operator's and the dead letters' transitions (``OPERATOR_TABLE``).
"""
