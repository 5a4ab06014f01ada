-- Run once by the postgres image on an empty data volume (mounted into
-- /docker-entrypoint-initdb.d by deploy/compose.yml), as POSTGRES_USER.
--
-- Prefect and MLflow each get a database of their own. Both migrate their schema with
-- alembic and keep their revision in a table named `alembic_version`: in one shared database
-- the second server to start reads the first one's revision, finds it unknown and fails to
-- migrate. Separate databases keep the two tables apart.
--
-- On a data volume made by an older compose file (one shared database) this script does not
-- run again: `docker compose -f deploy/compose.yml down -v` drops the volumes (and what they
-- hold), or create the two databases by hand with these statements.
CREATE DATABASE prefect;
CREATE DATABASE mlflow;
