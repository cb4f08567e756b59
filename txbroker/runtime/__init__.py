"""Process and event-loop helpers both sides share: the per-turn frame writer (client and
broker), serving an ASGI app (the broker's admin API, a service's check-back endpoint), stopping
on SIGINT/SIGTERM, and running a broker as a child process (benchmarks, tests, the demo)."""
