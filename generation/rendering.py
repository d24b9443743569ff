"""Model output as safe HTML: Markdown, highlighted code, math as MathML, then an allow-list sanitiser."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

import nh3
from django.utils.safestring import SafeString, mark_safe
from latex2mathml.converter import convert as latex_to_mathml
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.texmath import texmath_plugin
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


def _math(tex: str, *, display: bool) -> str:
    """TeX as MathML, which browsers lay out themselves (no script, no web font); TeX that
    cannot be converted stays visible as code."""
    try:
        return latex_to_mathml(tex, display="block" if display else "inline")
    except Exception:  # latex2mathml raises many kinds of errors on TeX it cannot read
        return f"<code>{escape(tex)}</code>"


def _render_math(tokens: Sequence[Token], index: int, display: bool) -> str:
    html = _math(tokens[index].content.strip(), display=display)
    return f"<p>{html}</p>\n" if display else html


# The token types of both math plugins: `$…$` and `$$…$$` (dollarmath), `\(…\)` and `\[…\]` (texmath).
INLINE_MATH = ("math_inline", "math_inline_double", "math_single")
DISPLAY_MATH = ("math_block", "math_block_label", "math_block_eqno")


def _enable_math(md: MarkdownIt) -> None:
    # No digit next to a `$`: "costs $5 or $10" stays prose.
    dollarmath_plugin(md, allow_digits=False, allow_labels=False, double_inline=True)
    texmath_plugin(md, delimiters="brackets")
    for name in (*INLINE_MATH, *DISPLAY_MATH):
        display = name in DISPLAY_MATH or name == "math_inline_double"

        def render(_renderer: Any, tokens: Sequence[Token], index: int, *_: Any, display: bool = display) -> str:
            return _render_math(tokens, index, display)

        md.add_render_rule(name, render)


# `html: False` turns raw HTML in the model's text into escaped text; `breaks` keeps the
# single line breaks models use for verses, addresses and the like.
_MARKDOWN = (
    MarkdownIt("commonmark", {"html": False, "breaks": True, "highlight": _highlight_code})
    .enable("table")
    .enable("strikethrough")
)
_MARKDOWN.core.ruler.push("alignment_classes", _alignment_classes)
_enable_math(_MARKDOWN)

# The MathML that latex2mathml writes, without what a model could abuse: no colours, links
# or styles (`\\color`, `\\href`, `\\style` are dropped with their attributes).
MATHML_TAGS = {
    *("math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msub", "msup", "msubsup", "mfrac"),
    *("msqrt", "mroot", "munder", "mover", "munderover", "mtable", "mtr", "mtd", "mstyle", "mpadded"),
    *("mphantom", "menclose"),
}
MATHML_ATTRIBUTES = {
    "math": {"display"},
    "mi": {"mathvariant"},
    "mo": {"stretchy", "fence", "separator", "lspace", "rspace", "accent", "movablelimits", "largeop", "form"},
    "mover": {"accent"},
    "munder": {"accentunder"},
    "munderover": {"accent", "accentunder"},
    "mfrac": {"linethickness"},
    "mtable": {"columnalign", "rowalign", "columnspacing", "rowspacing", "columnlines", "rowlines"},
    "mtd": {"columnalign", "rowalign", "columnspan", "rowspan"},
    "mstyle": {"displaystyle", "scriptlevel"},
    "mspace": {"width", "height", "depth"},
    "mpadded": {"width", "height", "depth", "lspace", "voffset"},
    "menclose": {"notation"},
}

# markdown-it already refuses raw HTML and `javascript:` links; the sanitiser is the
# second line of defence and the one place that says what may reach the page.
# (markdown-it writes strikethrough as <s>.)
SANITISER = nh3.Cleaner(
    tags={
        *("p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a", "span"),
        *("h1", "h2", "h3", "h4", "h5", "h6"),
        *("table", "thead", "tbody", "tr", "th", "td"),
        *MATHML_TAGS,
    },
    attributes={
        "a": {"href"},
        "code": {"class"},
        "span": {"class"},
        "ol": {"start"},
        **MATHML_ATTRIBUTES,
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
    return mark_safe(SANITISER.clean(_MARKDOWN.render(text)).strip())
