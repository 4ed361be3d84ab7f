"""The HTTP face of mmserve: FastAPI app, schemas, settings, CLI and life cycle.

The only package that speaks HTTP; it builds the object graph once
(``create_app``) and maps every typed error of the packages below to an
answer.
"""
