"""Offline stand-ins for AWS (tests, the notebooks' embedded default): local moto, Service Quotas, SageMaker runtime."""
