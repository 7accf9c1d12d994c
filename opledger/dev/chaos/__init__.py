"""Chaos runs and the provider-contract variants they (and the crash tests) exercise."""
