-- The orders database is POSTGRES_DB; billing gets its own.
CREATE DATABASE billing;
