"""Reading a ``multipart/form-data`` body strictly: what starlette's form parser lets pass, refused by name.

Starlette's parser (``request.form()``) reads a form field whose bytes are
not text in the body's charset as Latin-1, and a body that stops before its
closing boundary as the parts it finished (often none). JSON and v2 refuse
a text that is not UTF-8, and a cut-off body is malformed whatever it held,
so this parser refuses both:

    a text field that is not valid in the charset   400 invalid_text_encoding, naming the field
    no closing boundary (``--boundary--``)           400 invalid_multipart
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartParser

from server.errors import ApiError


class _StrictMultiPartParser(MultiPartParser):
    """Starlette's parser, refusing a field that is not text in the body's charset and a body never closed."""

    def __init__(self, headers: Headers, stream: AsyncIterator[bytes], text_fields: frozenset[str],
                 **limits: int) -> None:
        super().__init__(headers, stream, **limits)
        self.text_fields = text_fields
        self.is_closed = False

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None and part.field_name in self.text_fields:
            try:
                part.data.decode(self._charset)
            except UnicodeDecodeError as e:
                raise ApiError(400, "invalid_text_encoding",
                               f"{part.field_name} is not valid {self._charset}: byte 0x{part.data[e.start]:02x} at "
                               f"offset {e.start}; send text as {self._charset}", part.field_name) from e
        super().on_part_end()

    def on_end(self) -> None:
        self.is_closed = True


async def read_form(headers: Headers, stream: AsyncIterator[bytes], *, text_fields: frozenset[str], max_files: int,
                    max_fields: int, max_part_size: int) -> FormData:
    """The body's parts, as ``request.form()`` gives them; ``ApiError`` for what the parser above refuses.

    ``text_fields``: the fields whose bytes must be text (others, e.g. an image
    sent as a field instead of a file, are left for the caller to name).

    Starlette's own refusals (no boundary, too many parts, a part over
    ``max_part_size``) raise its ``MultiPartException``, as ``request.form()``'s do.
    """
    parser = _StrictMultiPartParser(headers, stream, text_fields, max_files=max_files, max_fields=max_fields,
                                    max_part_size=max_part_size)
    form = await parser.parse()
    if not parser.is_closed:
        await form.close()
        raise ApiError(400, "invalid_multipart", "the multipart body ends before its closing boundary "
                       "(--<boundary>--); it was cut off or is not multipart", "body")
    return form
