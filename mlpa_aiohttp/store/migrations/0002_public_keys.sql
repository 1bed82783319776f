-- App Attest device public keys (Alembic 482f016f00d7).
CREATE TABLE IF NOT EXISTS public_keys (
    key_id_b64 VARCHAR(255) PRIMARY KEY,
    public_key_pem TEXT,
    created_at TIMESTAMPTZ DEFAULT NOW()
);
