"""What happens to a connection before and after a route runs: body limit, header and body timeouts,
content types, auth, access log, the middleware that stacks them, and typed errors mapped to HTTP answers."""
