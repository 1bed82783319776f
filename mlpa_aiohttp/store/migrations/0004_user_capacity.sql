-- Signup cap (Alembic 919c4d382c42): the singleton counter row, locked FOR UPDATE by
-- every admission, and one claim per admitted base identity.
CREATE TABLE IF NOT EXISTS mlpa_user_capacity (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    max_identities BIGINT NOT NULL CHECK (max_identities >= 0),
    current_identities BIGINT NOT NULL CHECK (current_identities >= 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE TABLE IF NOT EXISTS mlpa_user_capacity_identities (
    base_identity TEXT PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
