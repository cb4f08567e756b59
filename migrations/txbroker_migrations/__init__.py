"""Alembic migrations for the tables txbroker keeps in a service's database (see
txbroker_sdk/tables.py).

Apply them with ``txbroker db upgrade --url URL``. They record their revision in their own
version table, ``txb_alembic_version``, so a service's own Alembic history is not disturbed;
a service may also add this package's ``versions/`` folder to its ``version_locations``
(branch label ``txbroker``).
"""
