-- App Attest challenges: one live challenge per key id (Alembic 8c787d0fbdc8).
CREATE TABLE IF NOT EXISTS challenges (
    key_id_b64 VARCHAR(255) PRIMARY KEY,
    challenge VARCHAR(255),
    created_at TIMESTAMPTZ DEFAULT NOW()
);
