"""Configuration: TOML -> typed ``Config``; the one home of every default and enum."""
