"""Evaluation: BEIR loader, metrics, full-stack runner."""
