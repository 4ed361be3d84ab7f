"""The process around the requests: life cycle and drain, model loading, monitoring set-up, the
garbage-collection policy, the compute watchdog and the separate ops port."""
