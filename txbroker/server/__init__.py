"""The broker server: topics, producers, consumer groups, the TCP protocol and HTTP admin."""
