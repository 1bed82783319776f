"""DEVELOPMENT ONLY: the loopback fakes the `demo`, `stack` and `fake-upstream` commands run
(LiteLLM, Firefox Accounts, LiteLLM's own database schema). The tests' other fakes live in
`tests/support`, outside the package."""
