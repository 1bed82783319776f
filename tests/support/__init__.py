"""Fakes and launchers only the tests use: kept out of the package, so the wheel and the image
carry none of them (the demo's fakes stay in `mlpa_aiohttp.testing`)."""
