"""Prediction service: FastAPI in front of an exported model (in-process TF or TF Serving)."""
