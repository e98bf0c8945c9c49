"""The model providers' rate limits, shared by every replica (issue 34; docs/rate-limits.md).

``headers`` reads what an answer announces, ``bucket`` holds the rules (the record kept per provider key
in ``lw_ratelimits`` and what a call, an answer and a 429 do to it): both pure. ``gate`` is the I/O a
service runs a model call through (``RateLimiter.gate``), ``fleet`` the read a person's view makes.
"""
