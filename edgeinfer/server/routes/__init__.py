"""Route handlers, one module per area; app.py lists them in one table."""
