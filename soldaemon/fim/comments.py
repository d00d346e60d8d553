"""Another file's text as a comment block, for families without a file
separator token."""

from __future__ import annotations

# Line-comment markers by LSP language id; block markers for the rest.
_LINE_COMMENT: dict[str, str] = {lang: marker for marker, langs in (
    ("#", ("python", "ruby", "shellscript", "sh", "bash", "zsh", "perl", "r", "yaml", "toml",
           "dockerfile", "makefile", "powershell", "coffeescript", "elixir", "julia", "nim",
           "cmake", "nix", "graphql", "tcl")),
    ("//", ("c", "cpp", "csharp", "java", "javascript", "javascriptreact", "typescript",
            "typescriptreact", "go", "rust", "swift", "kotlin", "scala", "dart", "php",
            "objective-c", "objective-cpp", "groovy", "zig", "jsonc", "fsharp", "proto",
            "solidity", "scss", "less", "d", "vala", "verilog", "systemverilog", "glsl", "hlsl",
            "cuda", "cuda-cpp")),
    ("--", ("sql", "lua", "haskell", "elm", "ada", "plsql", "purescript", "vhdl")),
    (";", ("clojure", "lisp", "scheme", "racket", "commonlisp", "ini", "asm")),
    ("%", ("latex", "tex", "erlang", "matlab", "prolog")),
    ("'", ("vb",)),
    ("!", ("fortran",)),
) for lang in langs}
_BLOCK_COMMENT: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("html", "xml", "markdown", "vue", "svelte"), ("<!--", "-->")),
    "css": ("/*", "*/"),
    "ocaml": ("(*", "*)"),
}
DEFAULT_LINE_COMMENT = "#"


def comment_header(language: str | None, path: str, text: str) -> str:
    """``text`` of ``path`` as a comment block in LSP ``language`` (unknown: ``#``) headed
    ``Path: {path}``, ending with "\\n"; a block closer inside ``text`` is defused."""
    lang = (language or "").lower()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    block = _BLOCK_COMMENT.get(lang)
    if block is not None:
        start, end = block
        broken = end[0] + " " + end[1:]
        body = "".join(line.replace(end, broken) + "\n" for line in lines)
        return f"{start} Path: {path}\n{body}{end}\n"
    c = _LINE_COMMENT.get(lang, DEFAULT_LINE_COMMENT)
    out = [f"{c} Path: {path}\n"]
    for line in lines:
        out.append(f"{c} {line}\n" if line.strip() else f"{c}\n")
    return "".join(out)
