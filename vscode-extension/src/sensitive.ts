// Documents whose text is never sent: the daemon's secret-file rule
// (soldaemon/sensitive.py), for the document being completed. No `vscode`
// import. The pattern list is kept equal to the Python one by a test
// (src/test/provider.test.ts).

/** Shell-style globs matched (case-insensitively) against every path component. */
export const SECRET_PATTERNS: readonly string[] = [".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "id_xmss*", "*.ppk", "known_hosts", "authorized_keys", ".ssh", ".gnupg", ".git", ".hg", ".svn", ".aws", ".azure", ".gcloud", ".kube", ".docker", ".netrc", "_netrc", ".npmrc", ".pypirc", ".pgpass", ".git-credentials", ".htpasswd", "credentials", "credentials.*", "*credentials*.json", "secrets.*", "*.secret", "*.secrets", "token", "*.token", "service-account*.json", "terraform.tfstate*", "*.tfvars"];

function globToRegExp(glob: string): RegExp {
    const body = glob.toLowerCase().replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    return new RegExp(`^${body}$`);
}

const COMPILED = SECRET_PATTERNS.map(globToRegExp);

/** True when `uri` is a file: URI whose path (or a directory above it)
 * matches a secret pattern: `.env`, keys, `~/.ssh/`, `.git/`, credential stores. */
export function isSecretUri(uri: string): boolean {
    const m = /^file:\/\/[^/]*(\/.*)$/i.exec(uri);
    if (!m) return false;
    let p: string;
    try {
        p = decodeURIComponent(m[1]);
    } catch {
        return true; // an undecodable path: do not send it
    }
    return p.toLowerCase().split("/").filter((part) => part).some((part) => COMPILED.some((re) => re.test(part)));
}
