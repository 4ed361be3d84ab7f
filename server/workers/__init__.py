"""``--api-workers N``: N API processes in front of one engine process (``supervisor`` starts them)."""
