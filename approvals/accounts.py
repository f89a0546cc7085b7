"""Signing in and out, and password reset: Django's views, with the limits of docs/security.md ("Throttling").

- Failed logins are counted by django-axes (in the database, per account and per address); past the
  limit, ``locked_out`` answers the sign-in page with a message, 429 and ``Retry-After``.
- Password reset exists only when email is configured (``AGENTRUN_PASSWORD_RESET``; otherwise its URLs
  are 404), is limited per address and per email address asked about (``AGENTRUN_PASSWORD_RESET_RATE``),
  and builds its links from ``AGENTRUN_PUBLIC_URL``, never from the request's Host header.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from agentrun.core.throttle import RateLimit, client_address, retry_after


def locked_out(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """django-axes' ``AXES_LOCKOUT_CALLABLE``: the sign-in page again, saying why and for how long."""
    cool_off = get_cool_off(request)
    seconds = cool_off.total_seconds() if cool_off else 0
    minutes = max(1, round(seconds / 60))
    message = (
        "Too many failed sign-ins for this account or from this address. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )
    response = render(request, "registration/login.html", {"locked_out": message}, status=429)
    if seconds:
        response["Retry-After"] = retry_after(seconds)
    return response


class _ResetOnlyWithEmail:
    """Password reset pages exist only when email can reach people."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.AGENTRUN_PASSWORD_RESET:
            raise Http404("Password reset is not available: email is not configured.")
        return super().dispatch(request, *args, **kwargs)


class PasswordResetView(_ResetOnlyWithEmail, auth_views.PasswordResetView):
    def form_valid(self, form: Any) -> HttpResponse:
        limit = RateLimit("password-reset", settings.AGENTRUN_PASSWORD_RESET_RATE)
        email = form.cleaned_data["email"].strip().lower()
        waits = [limit.check_and_hit(f"address:{client_address(self.request.META)}"), limit.check_and_hit(email)]
        if any(w is not None for w in waits):
            form.add_error(None, "Too many password reset requests. Try again later.")
            response = self.form_invalid(form)
            response.status_code = 429
            response["Retry-After"] = retry_after(max(w for w in waits if w is not None))
            return response
        public = urlsplit(settings.AGENTRUN_PUBLIC_URL)
        form.save(
            domain_override=public.netloc,  # the link's host: AGENTRUN_PUBLIC_URL's, whatever Host said
            use_https=public.scheme == "https",
            token_generator=self.token_generator,
            from_email=self.from_email,
            email_template_name=self.email_template_name,
            subject_template_name=self.subject_template_name,
            request=self.request,
            html_email_template_name=self.html_email_template_name,
            extra_email_context=self.extra_email_context,
        )
        return super(auth_views.PasswordResetView, self).form_valid(form)  # FormView's: the redirect


class PasswordResetDoneView(_ResetOnlyWithEmail, auth_views.PasswordResetDoneView):
    pass


class PasswordResetConfirmView(_ResetOnlyWithEmail, auth_views.PasswordResetConfirmView):
    pass


class PasswordResetCompleteView(_ResetOnlyWithEmail, auth_views.PasswordResetCompleteView):
    pass


# ``accounts/``: django.contrib.auth.urls' names, with the views above for password reset.
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("password_reset/", PasswordResetView.as_view(), name="password_reset"),
    path("password_reset/done/", PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("reset/<uidb64>/<token>/", PasswordResetConfirmView.as_view(), name="password_reset_confirm"),
    path("reset/done/", PasswordResetCompleteView.as_view(), name="password_reset_complete"),
]
