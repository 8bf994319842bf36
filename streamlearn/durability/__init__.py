"""What survives a crash: snapshots with the decision journal, and the experience log.

:mod:`~streamlearn.durability.checkpoint` (atomic snapshots of the loop's state, the
offsets they stand for, the journal of decisions published since — docs/daemon.md §4)
and :mod:`~streamlearn.durability.experience` (every learned decision, in segments, for
retraining and off-policy evaluation), kept by the loop through
:mod:`~streamlearn.durability.recorder`.
"""
