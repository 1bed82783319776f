-- DEVELOPMENT AND TESTS ONLY. Never run this against a LiteLLM deployment: there LiteLLM's
-- own migration owns these tables (with more columns, indexes and foreign keys).
--
-- The two LiteLLM tables mlpa-aiohttp reads and writes, with the columns it uses, so the
-- service can run against PostgreSQL without a real LiteLLM (the fake LiteLLM of
-- `python -m mlpa_aiohttp stack` inserts the end users, as LiteLLM's /customer/new does).
CREATE TABLE IF NOT EXISTS "LiteLLM_BudgetTable" (
    budget_id TEXT PRIMARY KEY,
    max_budget DOUBLE PRECISION,
    soft_budget DOUBLE PRECISION,
    max_parallel_requests INTEGER,
    tpm_limit BIGINT,
    rpm_limit BIGINT,
    model_max_budget JSONB,
    budget_duration TEXT,
    budget_reset_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    created_by TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_by TEXT
);
CREATE TABLE IF NOT EXISTS "LiteLLM_EndUserTable" (
    user_id TEXT PRIMARY KEY,
    alias TEXT,
    spend DOUBLE PRECISION NOT NULL DEFAULT 0,
    allowed_model_region TEXT,
    default_model TEXT,
    budget_id TEXT,
    blocked BOOLEAN NOT NULL DEFAULT false
);
