from __future__ import annotations

import re

import pytest
from django.template import Context, Template
from django.utils.safestring import SafeString

from generation.rendering import SANITISER, render_markdown

XSS_PAYLOADS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    '<a href="http://e.x" onclick="alert(1)">y</a>',
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![x](javascript:alert(1))",
    "<svg onload=alert(1)>",
    '```"><script>alert(1)</script>\ncode\n```',
]


def test_headings_lists_emphasis_and_strikethrough_render():
    html = render_markdown("# Title\n\n## Part\n\n- one\n- **two**\n\n1. *first*\n2. ~~gone~~")

    assert "<h1>Title</h1>" in html
    assert "<h2>Part</h2>" in html
    assert "<ul>\n<li>one</li>\n<li><strong>two</strong></li>\n</ul>" in html
    assert "<ol>" in html
    assert "<li><em>first</em></li>" in html
    assert "<s>gone</s>" in html


def test_tables_render_with_their_alignment_as_classes():
    html = render_markdown("| name | kind | n |\n|:-----|:----:|--:|\n| a | b | 1 |")

    assert "<table>" in html
    assert "<thead>" in html
    assert "<tbody>" in html
    assert '<th class="align-left">name</th>' in html
    assert '<th class="align-center">kind</th>' in html
    assert '<td class="align-right">1</td>' in html
    assert "style=" not in html  # the Content-Security-Policy lets no inline style apply


def test_result_is_a_safe_string_without_surrounding_whitespace():
    html = render_markdown("Hello there\n")

    assert isinstance(html, SafeString)
    assert html == "<p>Hello there</p>"


def test_single_line_breaks_are_kept():
    assert render_markdown("roses\nviolets") == "<p>roses<br>\nviolets</p>"


def test_python_fence_is_highlighted_with_pygments_classes():
    html = render_markdown("```python\ndef greet(name):\n    return 'hi ' + name  # say hi\n```")

    assert html.startswith('<pre><code class="language-python highlight">')
    assert '<span class="k">def</span>' in html
    assert '<span class="nf">greet</span>' in html
    assert '<span class="s1">' in html
    assert '<span class="c1"># say hi</span>' in html
    assert "style=" not in html  # classes, styled by app.css


def test_unknown_language_is_escaped_plain_text():
    html = render_markdown("```no-such-language\n<b>bold?</b> & more\n```")

    assert html == '<pre><code class="language-no-such-language">&lt;b&gt;bold?&lt;/b&gt; &amp; more\n</code></pre>'


def test_code_in_a_highlighted_block_is_escaped():
    html = render_markdown("```html\n<script>alert(1)</script>\n```")

    assert "<script" not in html
    assert "&lt;" in html
    assert "highlight" in html


@pytest.mark.parametrize("payload", XSS_PAYLOADS)
def test_hostile_model_output_comes_out_inert(payload):
    html = render_markdown(f"Before\n\n{payload}\n\nafter")

    assert "<script" not in html.lower()
    assert "<img" not in html.lower()
    assert "<svg" not in html.lower()
    assert not re.search(r"<[^>]*\son\w+\s*=", html, re.IGNORECASE)  # no event-handler attribute
    assert not re.search(r'href="\s*(javascript|data):', html, re.IGNORECASE)
    assert "Before" in html
    assert "after" in html


def test_raw_html_shows_as_escaped_text():
    html = render_markdown('<script>alert(1)</script>\n\n<a href="http://e.x" onclick="alert(1)">y</a>')

    assert "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>" in html
    assert '&lt;a href="http://e.x" onclick="alert(1)"&gt;y&lt;/a&gt;' in html


def test_javascript_link_stays_visible_as_text():
    assert render_markdown("[x](javascript:alert(1))") == "<p>[x](javascript:alert(1))</p>"


def test_web_links_get_rel_and_other_urls_lose_their_href():
    html = render_markdown("[web](https://example.com/a) [mail](mailto:a@example.com) [here](/admin/) [f](ftp://e.x)")

    assert '<a href="https://example.com/a" rel="nofollow noopener noreferrer">web</a>' in html
    assert '<a href="mailto:a@example.com" rel="nofollow noopener noreferrer">mail</a>' in html
    assert html.count("href=") == 2  # the relative and the ftp link keep their text only
    assert ">here</a>" in html


def test_markdown_filter_renders_in_templates_and_escapes_nothing_twice():
    template = Template("{% load chat_markdown %}{{ text|markdown }}")

    html = template.render(Context({"text": "**5 > 3** & <b>"}))

    assert html == "<p><strong>5 &gt; 3</strong> &amp; &lt;b&gt;</p>"


@pytest.mark.parametrize(
    ("text", "display"),
    [
        ("Euler: $e^{i\\pi}+1=0$.", "inline"),
        ("Inline \\(x^2\\) too.", "inline"),
        ("$$\\frac{a}{b}$$", "block"),
        ("\\[\\sum_{i=1}^{n} i\\]", "block"),
    ],
)
def test_math_in_each_delimiter_renders_as_mathml(text, display):
    html = render_markdown(text)

    assert f'<math display="{display}">' in html
    assert "<mi>" in html or "<mfrac>" in html
    assert "$" not in html
    assert "\\(" not in html
    assert "\\[" not in html


def test_prices_with_dollar_signs_stay_prose():
    assert render_markdown("It costs $5 or $10.") == "<p>It costs $5 or $10.</p>"


def test_math_inside_code_stays_code():
    assert render_markdown("`$x$`") == "<p><code>$x$</code></p>"


def test_tex_that_cannot_be_converted_stays_visible_as_code():
    assert render_markdown("$\\frac{$") == "<p><code>\\frac{</code></p>"


def test_math_cannot_carry_colours_links_or_markup():
    html = render_markdown("$\\color{red}{x}\\href{javascript:alert(1)}{y}\\style{color:red}{z} <script>$")

    assert "<math" in html
    assert "mathcolor" not in html
    assert "href" not in html
    assert "javascript" not in html
    assert "style=" not in html
    assert "<script" not in html
    assert "&lt;" in html  # the "<" is a visible operator


def test_mathml_with_unknown_elements_or_attributes_is_cut_down_by_the_sanitiser():
    # As if a converter wrote more than the allow-list: the sanitiser has the last word.
    cleaned = SANITISER.clean(
        '<math display="block" onclick="x()"><maction actiontype="toggle"><mi href="http://e.x">a</mi></maction>'
        '<annotation-xml encoding="text/html"><script>alert(1)</script></annotation-xml></math>'
    )

    assert cleaned == '<math display="block"><mi>a</mi></math>'
