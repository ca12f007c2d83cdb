"""Strata broker: request handling and the subsystems below it."""
