"""A job's summaries, below the epilog, the ctld-epilog and the report alike: what a node's
history knows of a job (:mod:`~slurmhealth.summary.collect`, the facts the epilog writes as
the node's ``summary.json`` and the report reads from a live history), and the compact
summary a job's AdminComment holds (:mod:`~slurmhealth.summary.admin_comment`: encoded,
capped, and read back checked)."""
