"""One self-contained HTML page: inline CSS, images as data: URIs, no scripts, no fonts,
no network. Readable on a light or dark screen (prefers-color-scheme) and in print;
figures sit on white cards either way, as they were drawn for white.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

CSS = """
:root { --bg:#ffffff; --fg:#1a1a1a; --muted:#555; --card:#f5f5f5; --line:#d0d0d0;
        --accent:#0072B2; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#15171a; --fg:#e8e8e8; --muted:#aaa; --card:#23262b; --line:#444;
          --accent:#56B4E9; } }
@media print { :root { --bg:#fff; --fg:#000; --muted:#333; --card:#fff; --line:#999; }
  section { break-inside: avoid-page; } }
body { background:var(--bg); color:var(--fg); margin:0 auto; max-width:1180px;
       padding:1.5rem; font:15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size:1.6rem; margin:0 0 .3rem; }
h2 { border-bottom:2px solid var(--accent); padding-bottom:.2rem; margin-top:2.2rem; }
h3 { margin-bottom:.3rem; }
p.lead, .muted { color:var(--muted); }
nav a { margin-right:1rem; color:var(--accent); }
table { border-collapse:collapse; margin:.6rem 0; font-variant-numeric:tabular-nums; }
th, td { border:1px solid var(--line); padding:.25rem .6rem; text-align:left;
         overflow-wrap:anywhere; }
td:first-child { overflow-wrap:normal; }  /* row names: break at spaces, never mid-word */
th { background:var(--card); }
td.num { text-align:right; }
figure { background:#ffffff; border:1px solid var(--line); border-radius:6px;
         padding:.5rem; margin:1rem 0; }
figure img { display:block; max-width:100%; height:auto; margin:0 auto; }
figcaption { color:#333333; font-size:.9rem; padding:.3rem .2rem 0; }
.good { color:#009E73; font-weight:600; } .bad { color:#D55E00; font-weight:600; }
.callout { background:var(--card); border-left:4px solid var(--accent); padding:.5rem .8rem; }
code { background:var(--card); padding:0 .25rem; border-radius:3px; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{esc(c)}</td>' if isinstance(c, (int, float))
                         else f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(data_uri: str, alt: str, caption: str) -> str:
    return (f'<figure><img src="{data_uri}" alt="{esc(alt)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    nav = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t, _ in sections)
    body = "".join(section(a, t, b) for a, t, b in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1><p class=\"lead\">{esc(subtitle)}</p><nav>{nav}</nav>"
            f"{body}</body></html>\n")
