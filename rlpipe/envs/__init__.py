"""Domains, their verifiers, and the mixture that samples domains by ratio."""
