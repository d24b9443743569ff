"""Model output as safe HTML: Markdown, highlighted code, then an allow-list sanitiser."""

from __future__ import annotations

from html import escape

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Token classes (`<span class="k">`), not inline styles: the palette lives in app.css
# and follows the light/dark colour scheme.
_FORMATTER = HtmlFormatter(nowrap=True)


def _highlight_code(code: str, language: str, _attrs: str) -> str:
    """Return a complete `<pre>` block, or "" to let markdown-it escape it as plain text."""
    try:
        lexer = get_lexer_by_name(language)
    except ClassNotFound:
        return ""
    return f'<pre><code class="language-{escape(language)} highlight">{highlight(code, lexer, _FORMATTER)}</code></pre>'


ALIGNMENTS = ("left", "center", "right")


def _alignment_classes(state: StateCore) -> None:
    """Table cells' alignment as a class (`align-right`) instead of the inline style that
    markdown-it writes: the Content-Security-Policy lets no inline style apply."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and (style := token.attrs.pop("style", None)):
            token.attrSet("class", f"align-{str(style).removeprefix('text-align:')}")


# `html: False` turns raw HTML in the model's text into escaped text; `breaks` keeps the
# single line breaks models use for verses, addresses and the like.
_MARKDOWN = (
    MarkdownIt("commonmark", {"html": False, "breaks": True, "highlight": _highlight_code})
    .enable("table")
    .enable("strikethrough")
)
_MARKDOWN.core.ruler.push("alignment_classes", _alignment_classes)

# markdown-it already refuses raw HTML and `javascript:` links; the sanitiser is the
# second line of defence and the one place that says what may reach the page.
# (markdown-it writes strikethrough as <s>.)
_SANITISER = nh3.Cleaner(
    tags={
        *("p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a", "span"),
        *("h1", "h2", "h3", "h4", "h5", "h6"),
        *("table", "thead", "tbody", "tr", "th", "td"),
    },
    attributes={
        "a": {"href"},
        "code": {"class"},
        "span": {"class"},
        "ol": {"start"},
    },
    # Column alignment from `|:--:|`.
    allowed_classes={cell: {f"align-{alignment}" for alignment in ALIGNMENTS} for cell in ("th", "td")},
    url_schemes={"http", "https", "mailto"},
    # A relative link in a model's answer would point into this site: drop it.
    url_relative="deny",
    link_rel="nofollow noopener noreferrer",
)


def render_markdown(text: str) -> SafeString:
    """Render a model's Markdown answer as sanitised HTML, safe to put in a page."""
    # mark_safe is sound here: the sanitiser has just reduced the HTML to the allow-list.
    return mark_safe(_SANITISER.clean(_MARKDOWN.render(text)).strip())
