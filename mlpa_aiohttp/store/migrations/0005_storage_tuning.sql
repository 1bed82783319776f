-- Storage tuning (Alembic b3ea148a6d0b). Challenges and the capacity row are rewritten
-- constantly: vacuum them early; leave free space in pages for HOT updates.
ALTER TABLE challenges SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_cost_limit = 2000);
ALTER TABLE public_keys SET (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE mlpa_user_capacity SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000
);
