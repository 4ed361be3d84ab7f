"""``--api-workers N``: N API processes in front of the engines (one, or `--engines N`) (``supervisor`` starts them)."""
