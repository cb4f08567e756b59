"""Transactional messages: half messages, two-phase commit, back-checks, parking."""
