"""What tests share: live sites and their clients, model servers, helpers of each layer."""

# Every test user's password: long enough for Django's validators.
PASSWORD = "correct-horse-battery-staple"
