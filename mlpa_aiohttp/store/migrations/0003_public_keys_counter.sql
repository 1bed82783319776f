-- Assertion counter and last update (Alembic 5b4ed32c7b2b). Existing rows are
-- backfilled, then the defaults are dropped: every insert must supply both.
ALTER TABLE public_keys ADD COLUMN IF NOT EXISTS counter BIGINT NOT NULL DEFAULT 0;
ALTER TABLE public_keys ADD COLUMN IF NOT EXISTS updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW();
ALTER TABLE public_keys ALTER COLUMN counter DROP DEFAULT;
ALTER TABLE public_keys ALTER COLUMN updated_at DROP DEFAULT;
