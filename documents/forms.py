from __future__ import annotations

from django import forms

from documents.extraction import KINDS


class DocumentUploadForm(forms.Form):
    # Empty files pass here and are refused with the other unreadable ones (extraction);
    # Django's upload handling shortens names past 255 characters, keeping the extension.
    file = forms.FileField(
        label="Attach a file",
        max_length=255,
        allow_empty_file=True,
        widget=forms.ClearableFileInput(attrs={"accept": ",".join(KINDS)}),
        error_messages={
            "required": "Choose a file to attach.",
            "invalid": "Send the file as a multipart form upload.",
        },
    )
