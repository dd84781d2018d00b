"""The Quart-Trio front end: ``create_app(settings)``."""

from voiceactors.http.app import create_app, voice_state

__all__ = ["create_app", "voice_state"]
