"""Log-in with an LDAP directory or Active Directory (django-auth-ldap, an optional extra).

Imported only where CHAT_LDAP_SERVER_URI is set (chatsite/settings.py then lists
ldap_login.backends.LdapBackend): a site without the extra never imports django_auth_ldap.
"""
