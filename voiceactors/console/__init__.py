"""The voice console's assets (HTML, JS, CSS), served by ``voiceactors.http.console``."""
