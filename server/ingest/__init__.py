"""A request body becomes an intake item: JSON and multipart parsing with their limits, image decoding
and the bounded pool it runs on."""
