"""Per-request candidate sets: requests whose candidates carry their own features.

:class:`~streamlearn.candidates.sets.CandidateSets` holds a batch of requests as
segments (a shared context per request, one feature row per candidate);
:mod:`~streamlearn.candidates.joint` maps (context, candidate) pairs to joint
features; :mod:`~streamlearn.candidates.learners` decides and learns over them
with segment operations, never a per-request Python loop (docs/learners.md,
"Candidate sets").
"""
