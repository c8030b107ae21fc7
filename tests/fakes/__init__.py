"""Shared stand-ins and helpers the tests import: fake servers, local AWS fixtures, the learner venv."""
