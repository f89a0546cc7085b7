"""URL converters shared by the REST routes and the dashboard's."""

from __future__ import annotations

from django.urls import register_converter


class AnyIdConverter:
    """Any id the API accepts (thread and resource ids are any text): "/" and line breaks included,
    which ``path`` (it stops at "\\n") and ``str`` (it stops at "/") are not."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AnyIdConverter, "anyid")
