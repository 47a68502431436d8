"""The resident node agent: one per node, inside ``slurmhealth exporter`` (or alone,
``slurmhealth agent``). It keeps the GPU library open, holds the node's latest snapshot and
its view of the node's jobs, and answers the prolog and epilog over a root-only Unix
socket in the node's run dir (``protocol``); the hooks' thin client (``client``) imports
the standard library only and falls back to the in-process hooks when the agent is absent,
slow or of another protocol version. ``server`` is the agent itself.

Nothing here is imported by the client's happy path but ``protocol`` and ``client``.
"""
